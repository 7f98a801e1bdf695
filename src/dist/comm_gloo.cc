/* comm_gloo.cc — the Gloo communicator: CPU ranks without MPI (torchrun, or
 * colt's own processes) run their collectives over Gloo's TCP transport, its
 * full mesh set up through colt's store (a gloo::rendezvous::Store backed by
 * store.h). Every Gloo call carries the communicator's timeout; Gloo throws on
 * a timeout or a closed peer connection, and this file turns that into colt's
 * error message. Compiled only where Gloo is found (COLT_HAVE_GLOO).
 * Not here: Gloo's CUDA or ibverbs transports; reduce_scatter is an all_reduce
 * into a scratch copy (Gloo 0.5 has no options-style reduce_scatter), which
 * moves twice the bytes — acceptable for the CPU reference path. */
/* core/error.h is C11; C++ spells _Noreturn differently. */
#define _Noreturn [[noreturn]]
#include "dist/comm_internal.h"
#undef _Noreturn

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

namespace {

/* Gloo's rendezvous keys ("0", "1", ...) in colt's store, under a prefix per
 * communicator. Waits are store_get's, bounded by the store's timeout. */
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(::Store* store, std::string prefix) : store_(store), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    char err[ERR_LEN];
    if (store_set(store_, (prefix_ + key).c_str(), data.data(), data.size(), err) != COLT_OK) throw std::runtime_error(err);
  }

  std::vector<char> get(const std::string& key) override {
    char err[ERR_LEN];
    void* data = nullptr;
    size_t len = 0;
    if (store_get(store_, &data, &len, (prefix_ + key).c_str(), err) != COLT_OK) throw std::runtime_error(err);
    std::vector<char> out(static_cast<char*>(data), static_cast<char*>(data) + len);
    free(data);
    return out;
  }

  void wait(const std::vector<std::string>& keys) override {
    for (const auto& key : keys) get(key);  // values are a few bytes: waiting by reading is fine
  }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }

 private:
  ::Store* store_;
  std::string prefix_;
};

struct GlooImpl {
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::string hostname;  // the interface the mesh listens on (a split's mesh uses it too)
  uint32_t tag = 0;  // a fresh tag per op keeps consecutive ops' messages apart
  std::vector<char> scratch;
};

GlooImpl* impl_of(Comm* c) { return static_cast<GlooImpl*>(c->impl); }

std::chrono::milliseconds timeout_of(const Comm* c) {
  return std::chrono::milliseconds(static_cast<long long>(c->timeout_s * 1000.0));
}

/* One line from Gloo's message, without its "[file.cc:123] " prefix. */
std::string first_line(const char* what) {
  std::string s(what);
  size_t nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find("] ");
    if (close != std::string::npos) s.erase(0, close + 2);
  }
  return s.size() > 200 ? s.substr(0, 200) + "..." : s;
}

int gloo_failed(Comm* c, const char* what, const std::exception& e, char* err) {
  std::string msg = first_line(e.what());
  if (msg.find("imed out") != std::string::npos)
    return comm_fail(c, err, "%s did not complete within %g s (a rank died or hung?)", what, c->timeout_s);
  return comm_fail(c, err, "%s failed (a rank died?): gloo: %s", what, msg.c_str());
}

template <typename T>
void sum_into(gloo::AllreduceOptions& o, void* data, size_t count) {
  o.setOutput(static_cast<T*>(data), count);
  o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
}

void all_reduce_in_place(Comm* c, void* data, size_t count, CommDtype dtype) {
  gloo::AllreduceOptions o(impl_of(c)->context);
  switch (dtype) {
    case COMM_FLOAT32: sum_into<float>(o, data, count); break;
    case COMM_FLOAT64: sum_into<double>(o, data, count); break;
    case COMM_INT64: sum_into<int64_t>(o, data, count); break;
    case COMM_BYTE:
    case COMM_BFLOAT16: throw std::logic_error("these elements cannot be summed here");
  }
  o.setTag(impl_of(c)->tag++);
  o.setTimeout(timeout_of(c));
  gloo::allreduce(o);
}

int gloo_all_reduce(Comm* c, void* data, size_t count, CommDtype dtype, void*, char* err) {
  char what[96];
  comm_describe(what, sizeof what, "all_reduce", count, dtype);
  try {
    all_reduce_in_place(c, data, count, dtype);
  } catch (const std::exception& e) {
    return gloo_failed(c, what, e, err);
  }
  return COLT_OK;
}

/* An all_reduce (every rank gets the sum; only root's is promised): Gloo's
 * CPU ranks move host memory, where the saving does not matter. */
int gloo_reduce(Comm* c, void* data, size_t count, CommDtype dtype, int root, void*, char* err) {
  char what[128];
  comm_describe(what, sizeof what, "reduce", count, dtype);
  snprintf(what + strlen(what), sizeof what - strlen(what), " to rank %d", root);
  try {
    all_reduce_in_place(c, data, count, dtype);
  } catch (const std::exception& e) {
    return gloo_failed(c, what, e, err);
  }
  return COLT_OK;
}

int gloo_reduce_scatter(Comm* c, void* out, const void* in, size_t count, CommDtype dtype, void*, char* err) {
  char what[96];
  comm_describe(what, sizeof what, "reduce_scatter", count, dtype);
  size_t block = count * comm_dtype_size(dtype);
  GlooImpl* g = impl_of(c);
  try {
    g->scratch.resize(block * (size_t)c->world_size);
    memcpy(g->scratch.data(), in, g->scratch.size());
    all_reduce_in_place(c, g->scratch.data(), count * (size_t)c->world_size, dtype);
  } catch (const std::exception& e) {
    return gloo_failed(c, what, e, err);
  }
  memcpy(out, g->scratch.data() + block * (size_t)c->rank, block);
  return COLT_OK;
}

int gloo_all_gather(Comm* c, void* out, const void* in, size_t count, CommDtype dtype, void*, char* err) {
  char what[96];
  comm_describe(what, sizeof what, "all_gather", count, dtype);
  size_t bytes = count * comm_dtype_size(dtype);
  try {
    gloo::AllgatherOptions o(impl_of(c)->context);
    o.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes);
    o.setOutput(static_cast<uint8_t*>(out), bytes * (size_t)c->world_size);
    o.setTag(impl_of(c)->tag++);
    o.setTimeout(timeout_of(c));
    gloo::allgather(o);
  } catch (const std::exception& e) {
    return gloo_failed(c, what, e, err);
  }
  return COLT_OK;
}

int gloo_broadcast(Comm* c, void* data, size_t count, CommDtype dtype, int root, void*, char* err) {
  char what[128];
  comm_describe(what, sizeof what, "broadcast", count, dtype);
  snprintf(what + strlen(what), sizeof what - strlen(what), " from rank %d", root);
  try {
    gloo::BroadcastOptions o(impl_of(c)->context);
    o.setOutput(static_cast<uint8_t*>(data), count * comm_dtype_size(dtype));
    o.setRoot(root);
    o.setTag(impl_of(c)->tag++);
    o.setTimeout(timeout_of(c));
    gloo::broadcast(o);
  } catch (const std::exception& e) {
    return gloo_failed(c, what, e, err);
  }
  return COLT_OK;
}

int gloo_barrier(Comm* c, char* err) {
  try {
    gloo::BarrierOptions o(impl_of(c)->context);
    o.setTag(impl_of(c)->tag++);
    o.setTimeout(timeout_of(c));
    gloo::barrier(o);
  } catch (const std::exception& e) {
    return gloo_failed(c, "barrier", e, err);
  }
  return COLT_OK;
}

/* Gloo has no abort: ending the process (comm_abort does) closes this rank's
 * connections, and every peer's pending op fails at once. */
void gloo_abort(Comm*, const char*) {}

void gloo_close(Comm* c) {
  delete impl_of(c);
  c->impl = nullptr;
}

int gloo_split(Comm* c, int color, int key, Comm* child, char* err);

const CommOps GLOO_OPS = {
    gloo_all_reduce, gloo_reduce, gloo_reduce_scatter, gloo_all_gather, gloo_broadcast, gloo_barrier,
    gloo_split, nullptr, gloo_abort, nullptr,
    gloo_close,
};

/* A mesh of its own for the ranks of one color: each rank's (color, key)
 * gathered first (bounded), then a new context connected through the store
 * under keys of the split's number and the color. */
int gloo_split(Comm* c, int color, int key, Comm* child, char* err) {
  int64_t mine[2] = {color, key};
  std::vector<int64_t> all(2 * (size_t)c->world_size);
  if (gloo_all_gather(c, all.data(), mine, 2, COMM_INT64, nullptr, err) != COLT_OK) return COLT_ERR;
  int rank = 0, size = 0;
  for (int r = 0; r < c->world_size; r++) {
    if (all[2 * r] != color) continue;
    size++;
    if (all[2 * r + 1] < key || (all[2 * r + 1] == key && r < c->rank)) rank++;
  }
  char counter[64];
  snprintf(counter, sizeof counter, "gloo/splits/%d", c->rank);
  int64_t nth = 0;
  if (store_add(c->store, &nth, counter, 1, err) != COLT_OK) return COLT_ERR;
  GlooImpl* g = new GlooImpl();
  g->hostname = impl_of(c)->hostname;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = g->hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    g->context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    g->context->setTimeout(timeout_of(c));
    StoreAdapter store(c->store, "gloo/split/" + std::to_string(nth) + "/" + std::to_string(color) + "/");
    g->context->connectFullMesh(store, device);
  } catch (const std::exception& e) {
    delete g;
    return comm_fail(c, err, "connecting Gloo's mesh of a group of %d ranks failed: %s", size, first_line(e.what()).c_str());
  }
  child->rank = rank;
  child->world_size = size;
  child->impl = g;
  child->ops = &GLOO_OPS;
  return COLT_OK;
}

/* The address of this machine's interface toward host (the route a UDP
 * "connect" picks), so peers on other nodes can reach Gloo's listener. */
std::string local_address_toward(const char* host, int port) {
  char self[256] = "127.0.0.1";
  struct addrinfo hints = {}, *res = nullptr;
  hints.ai_socktype = SOCK_DGRAM;
  std::string port_s = std::to_string(port > 0 ? port : 9);
  if (getaddrinfo(host, port_s.c_str(), &hints, &res) != 0 || !res) return self;
  int fd = socket(res->ai_family, SOCK_DGRAM, 0);
  struct sockaddr_storage ss = {};
  socklen_t sl = sizeof ss;
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 && getsockname(fd, (struct sockaddr*)&ss, &sl) == 0) {
    if (ss.ss_family == AF_INET) inet_ntop(AF_INET, &((struct sockaddr_in*)&ss)->sin_addr, self, sizeof self);
    else if (ss.ss_family == AF_INET6) inet_ntop(AF_INET6, &((struct sockaddr_in6*)&ss)->sin6_addr, self, sizeof self);
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return self;
}

}  // namespace

extern "C" int comm_gloo_open(Comm* c, const CommOptions* opt, char* err) {
  if (c->gpu) return comm_fail(c, err, "the Gloo communicator moves host memory: GPU ranks use NCCL");
  if (comm_need_store(c, opt, err) != COLT_OK) return COLT_ERR;
  /* Each communicator gets its own keys: the n-th one a rank opens uses
   * gloo/<n>/, the same n on every rank since all open them in the same order. */
  char counter[64];
  snprintf(counter, sizeof counter, "gloo/opened/%d", c->rank);
  int64_t nth = 0;
  if (store_add(c->store, &nth, counter, 1, err) != COLT_OK) return COLT_ERR;
  const char* master = c->env->master_addr[0] ? c->env->master_addr : "127.0.0.1";
  GlooImpl* g = new GlooImpl();
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = local_address_toward(master, c->env->master_port);
    g->hostname = attr.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    g->context = std::make_shared<gloo::rendezvous::Context>(c->rank, c->world_size);
    g->context->setTimeout(timeout_of(c));
    StoreAdapter store(c->store, "gloo/" + std::to_string(nth) + "/");
    g->context->connectFullMesh(store, device);
  } catch (const std::exception& e) {
    delete g;
    std::string msg = first_line(e.what());
    if (msg.rfind("rank ", 0) == 0) return errorf(err, "%s", msg.c_str()); /* already colt's (from the store) */
    return comm_fail(c, err, "connecting Gloo's mesh of %d ranks failed: %s", c->world_size, msg.c_str());
  }
  c->impl = g;
  c->ops = &GLOO_OPS;
  return COLT_OK;
}

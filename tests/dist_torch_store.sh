#!/usr/bin/env bash
# dist_torch_store.sh — colt's store against PyTorch's c10d TCPStore, both ways:
# colt as a client of torch's server (libuv and classic backends; what colt does
# under torchrun, whose agent serves that store on MASTER_PORT), and a torch
# client against colt's server. Needs a Python with torch (COLT_TORCH_PYTHON,
# default python3); exits 77 (skipped) where torch cannot be imported.
# Usage: dist_torch_store.sh <folder of test_dist_store>.
set -u
bin_dir=${1:?usage: dist_torch_store.sh <folder with test_dist_store>}
exe=$bin_dir/test_dist_store
py=${COLT_TORCH_PYTHON:-python3}
if ! "$py" -c "import torch.distributed" >/dev/null 2>&1; then
  echo "dist_torch_store: PyTorch is not importable by $py (set COLT_TORCH_PYTHON): skipped"
  exit 77
fi
[ -x "$exe" ] || { echo "dist_torch_store: $exe not built"; exit 1; }
timeout 120 "$py" - "$exe" <<'PY'
import datetime, socket, subprocess, sys
import torch
import torch.distributed as dist

exe = sys.argv[1]
failed = 0
print("dist_torch_store: torch", torch.__version__)

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port

# colt as a client of torch's server (as under torchrun's agent store).
for libuv in (True, False):
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=30),
                          wait_for_workers=False, use_libuv=libuv)
    peer = subprocess.Popen([exe, "--torch-peer", str(store.port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    store.set("colt/x/0/from_torch", "hello")
    store.set("colt/x/0/count", "10")
    got = store.get("colt/x/0/from_colt")
    # torch's half of colt's barrier: add to the counter; the last one sets done.
    if store.add("colt/x/0/barrier/b/1", 1) == 2:
        store.set("colt/x/0/barrier/b/1/done", "1")
    store.wait(["colt/x/0/barrier/b/1/done"])
    out, _ = peer.communicate(timeout=60)
    ok = peer.returncode == 0 and got == b"hi" and store.get("colt/x/0/count") == b"15"
    failed += not ok
    print(f"dist_torch_store: colt client, torch server (libuv={libuv}): {'pass' if ok else 'FAIL'}")
    print("    " + out.strip().replace("\n", "\n    "))

# a torch client against colt's server.
port = free_port()
server = subprocess.Popen([exe, "--serve", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
server.stdout.readline()  # "serving on PORT"
client = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
client.set("from_torch", "yo")
checks = [client.get("from_colt") == b"hey",
          client.add("n", 3) == 3 and client.add("n", 4) == 7 and client.get("n") == b"7",
          client.check(["from_colt"]) and not client.check(["missing"])]
try:
    client.wait(["missing"], datetime.timedelta(seconds=1))
    checks.append(False)
except Exception:
    checks.append(True)  # timed out, and the connection goes on:
checks += [client.num_keys() == 3, client.delete_key("n"), client.num_keys() == 2]
client.set("done", "1")
out, _ = server.communicate(timeout=60)
ok = server.returncode == 0 and all(checks)
failed += not ok
print(f"dist_torch_store: torch client, colt server: {'pass' if ok else 'FAIL'} ({sum(checks)} of {len(checks)} checks)")
print("    " + out.strip().replace("\n", "\n    "))
print(f"dist_torch_store: 3 runs, {failed} failed")
sys.exit(1 if failed else 0)
PY

/* hub_cache.h — a model named as transformers names it ("Qwen/Qwen2.5-0.5B-Instruct") found in the local
 * Hugging Face cache, as transformers finds it offline. Not a downloader: colt reads local files only. */
#ifndef COLT_MODEL_HUB_CACHE_H
#define COLT_MODEL_HUB_CACHE_H

/* The folder to load for `model`: `model` itself when it is a folder (or not a Hub name: the loader then
 * says it is missing), else the cache's snapshot of `revision` (NULL: "main"; a branch or tag through
 * refs/, or a 40-hex commit) under $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub. *out is
 * malloc'd. A Hub name the cache lacks is an error that names the cache folder and the `hf download`
 * command that fetches it. */
int hub_cache_model_folder(char **out, const char *model, const char *revision, char *err);

#endif

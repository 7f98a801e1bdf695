/* sampler.h — the host sampler lives in backend/sampling.h (the backends'
 * sample op builds on it); this header keeps engine code's include working. */
#ifndef COLT_ENGINE_SAMPLER_H
#define COLT_ENGINE_SAMPLER_H

#include "backend/sampling.h"

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mrc_metrics.h - counter updates. Counter maps are per-CPU arrays of struct mrc_counter (or
 * struct mrc_ev_counters), indexed by row = id * width + column; userspace sums the CPUs and turns
 * rows into (port|host, reason|action|bucket) labels.
 */
#ifndef MRC_METRICS_H
#define MRC_METRICS_H

#include "mrc_abi.h"

/* Add one packet of `len` bytes to a counter row found with map.lookup(&row) (BCC rewrites map calls
 * only outside macros, so callers look up and this adds). */
static __always_inline void mrc_add(struct mrc_counter *c, __u64 len)
{
	if (c) {
		c->packets += 1;
		c->bytes += len;
	}
}

/* Clamp an id into its table (ids beyond the table count under 0, "unknown"). */
static __always_inline __u32 mrc_id(__u32 id, __u32 max)
{
	return id < max ? id : 0;
}

#endif /* MRC_METRICS_H */

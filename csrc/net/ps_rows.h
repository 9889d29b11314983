/*
 * ps_rows.h - a ps shard's embedding rows (ps.h, PULL_ROWS and
 * PUSH_PULL_ROWS), for ps_server.c: the model's table layout and the rows
 * this shard holds of it, the checks of a worker's layout, ids and rows
 * pushes, and the accumulation and application of pushed rows (the dense
 * segments and the marked rows alone). Not thread-safe: the shard's lock
 * covers every call. Not here: the wire (ps_server.c reads the requests).
 */
#ifndef NET_PS_ROWS_H
#define NET_PS_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "net/ps.h"

typedef struct PsShardRows {
    uint64_t offset, count; /* the shard, for messages */
    OptimRows *layout;      /* [nlayout] the model's tables (global offsets) */
    int nlayout, ntables, nsegs;
    PsTable *tables;     /* [ntables] the rows this shard holds */
    OptimRows *local;    /* [ntables] the same in shard coordinates; ids: the rows pushed since
                            the last apply (into touched), sorted by ps_rows_apply */
    uint64_t (*segs)[2]; /* [nsegs] the dense segments */
    uint64_t dense_count;
    uint64_t *base;   /* [ntables] each table's first slot in marked / touched */
    uint8_t *marked;  /* [rows held] pushed since the last apply */
    int32_t *touched; /* [rows held] local row ids, per table from base[t] */
} PsShardRows;

/* Checks the layout (cfg->tables) against cfg's shard (whole rows) and
 * keeps a copy; SG_EINVAL naming the table. ps_rows_free in any case. */
int ps_rows_init(PsShardRows *r, const PsServerConfig *cfg, SgError *err);
void ps_rows_free(PsShardRows *r);

/* HELLO: the worker's n tables (aux: n u64 triples off, rows, dim) must be
 * the layout; SG_ECLUSTER naming the first that differs. */
int ps_rows_check_layout(const PsShardRows *r, const char *peer, uint64_t n, const uint8_t *aux,
                         SgError *err);

/* ids[0..nids) of table t: a known table, rows this shard holds, sorted,
 * unique (SG_EINVAL naming the table, row, peer and shard); *held: the
 * shard's part of it (NULL when it holds none and nids is 0). */
int ps_rows_check_ids(const PsShardRows *r, const char *peer, uint64_t t, const int32_t *ids,
                      size_t nids, const PsTable **held, SgError *err);

/* What a PUSH_PULL_ROWS of op header v carries: *aux bytes of entries and
 * ids, then *nvals gradients (the dense segments' and v[3] row floats);
 * SG_EPROTO naming the peer for counts beyond this shard, so that nothing
 * is allocated for them. */
int ps_rows_push_size(const PsShardRows *r, const char *peer, const uint64_t v[4], size_t *aux,
                      size_t *nvals, SgError *err);

/* A PUSH_PULL_ROWS (v: wire, e entries, k ids, row floats; aux: the
 * entries then the ids; vals: the dense segments' then the rows'
 * gradients as f32). Checks it whole; with accum (count floats) not NULL,
 * adds it there and marks its rows. */
int ps_rows_push(PsShardRows *r, const char *peer, const uint64_t v[4], const uint8_t *aux,
                 const float *vals, float *accum, SgError *err);

/* Applies accum * scale to params at the dense segments and the marked
 * rows (optim_step_rows with optim, else apply per segment and per row),
 * then clears those floats of accum and the marks. */
int ps_rows_apply(PsShardRows *r, float *params, float *accum, float scale, Optimizer *optim,
                  PsApplyFn apply, void *apply_ctx, SgError *err);

/* Forgets the marks (after a dense apply cleared accum whole). */
void ps_rows_clear_marks(PsShardRows *r);

/* Copies the dense segments of params (the shard's) into out, in order. */
void ps_rows_gather_dense(const PsShardRows *r, const float *params, float *out);

#endif /* NET_PS_ROWS_H */

/*
 * sequence_parse.c - SequenceExample feature lists into batch columns.
 *
 * Values stay concatenated here (records' steps one after another, with
 * splits); padding FixedLenSequence lists to [rows, max_steps, ...] happens
 * where the output arrays are made, once the longest list is known.
 */
#include "record/sequence_parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct SeqSlot {
    const uint8_t *value; /* FeatureList body of the last entry with this key */
    size_t value_len;
    int seen;
} SeqSlot;

int seq_batch_init(SeqBatch *b, const ExSchema *lists, const int *allow_missing, size_t cap,
                   SgError *err)
{
    memset(b, 0, sizeof *b);
    b->lists = lists;
    b->allow_missing = allow_missing;
    b->cap = cap;
    size_t n = lists->n ? lists->n : 1;
    b->cols = calloc(n, sizeof *b->cols);
    b->slots = calloc(n, sizeof *b->slots);
    if (b->cols == NULL || b->slots == NULL)
        goto oom;
    for (size_t i = 0; i < lists->n; i++) {
        SeqColumn *c = &b->cols[i];
        c->row_splits = calloc(cap + 1, sizeof *c->row_splits);
        if (c->row_splits == NULL ||
            ex_grow((void **)&c->step_splits, &c->steps_cap, 1, sizeof *c->step_splits) < 0)
            goto oom;
        c->step_splits[0] = 0;
    }
    return 0;
oom:
    seq_batch_free(b);
    return sg_fail(err, SG_ENOMEM, "out of memory for a batch of %zu sequences", cap);
}

void seq_batch_free(SeqBatch *b)
{
    if (b->cols)
        for (size_t i = 0; i < b->lists->n; i++) {
            SeqColumn *c = &b->cols[i];
            ex_values_free(&c->v);
            free(c->step_splits);
            free(c->row_splits);
        }
    free(b->cols);
    free(b->slots);
    b->cols = NULL;
    b->slots = NULL;
}

static int list_cb(void *ctx, const ExEntry *e, SgError *err)
{
    SeqBatch *b = ctx;
    (void)err;
    ptrdiff_t i = ex_schema_find(b->lists, e->key, e->key_len);
    if (i >= 0) {
        b->slots[i].value = e->value;
        b->slots[i].value_len = e->value_len;
        b->slots[i].seen = 1;
    }
    return 0;
}

typedef struct StepCtx {
    SeqBatch *b;
    size_t i;
    const uint8_t *rec;
} StepCtx;

static int step_mismatch(const ExSpec *sp, size_t step, const ExFeature *f, SgError *err)
{
    char want[96];
    if (sp->kind == EX_SPEC_VARLEN)
        snprintf(want, sizeof want, "a %s list", ex_kind_name(sp->wire));
    else
        snprintf(want, sizeof want, "%zu %s value%s", sp->count, ex_kind_name(sp->wire),
                 sp->count == 1 ? "" : "s");
    return sg_fail(err, SG_ESCHEMA, "feature list '%s' step %zu: expected %s, found %zu %s value%s",
                   sp->name, step, want, f->count, ex_kind_name(f->kind), f->count == 1 ? "" : "s");
}

/* One step (a Feature) of list i: checked, then its values appended. */
static int step_cb(void *vctx, const ExEntry *e, SgError *err)
{
    StepCtx *sc = vctx;
    SeqBatch *b = sc->b;
    const ExSpec *sp = &b->lists->specs[sc->i];
    SeqColumn *c = &b->cols[sc->i];
    size_t step = c->nsteps - (size_t)c->row_splits[b->rows];
    ExFeature f;
    int rc = ex_feature_decode(sc->rec, e->value, e->value_len, &f, err);
    if (rc < 0)
        return sg_context(err, "feature list '%s' step %zu: ", sp->name, step);
    if ((f.kind != EX_NONE && f.kind != sp->wire) ||
        (sp->kind == EX_SPEC_FIXED && f.count != sp->count))
        return step_mismatch(sp, step, &f, err);
    if (ex_values_append(&c->v, sp, &f, err) < 0)
        return sg_context(err, "feature list '%s' step %zu: ", sp->name, step);
    if (ex_grow((void **)&c->step_splits, &c->steps_cap, c->nsteps + 2, sizeof *c->step_splits) < 0)
        return sg_fail(err, SG_ENOMEM, "out of memory for feature list '%s'", sp->name);
    c->step_splits[++c->nsteps] = (int64_t)c->v.nvalues;
    return 0;
}

int seq_batch_add(SeqBatch *b, const uint8_t *rec, size_t n, SgError *err)
{
    if (b->rows >= b->cap)
        return sg_fail(err, SG_ESTATE, "batch is full (%zu rows)", b->cap);
    const ExSchema *s = b->lists;
    for (size_t i = 0; i < s->n; i++)
        b->slots[i].seen = 0;
    int rc = ex_sequence_foreach(rec, n, NULL, list_cb, b, err);
    if (rc < 0)
        return rc;
    size_t i = 0;
    for (; i < s->n; i++) {
        const ExSpec *sp = &s->specs[i];
        if (!b->slots[i].seen) {
            if (sp->kind == EX_SPEC_FIXED && !b->allow_missing[i]) {
                rc =
                    sg_fail(err, SG_ESCHEMA,
                            "feature list '%s': required (steps of %zu %s value%s, "
                            "allow_missing not set) but missing",
                            sp->name, sp->count, ex_kind_name(sp->wire), sp->count == 1 ? "" : "s");
                break;
            }
            continue;
        }
        StepCtx sc = {b, i, rec};
        rc = ex_feature_list_foreach(rec, b->slots[i].value, b->slots[i].value_len, step_cb, &sc,
                                     err);
        if (rc < 0)
            break;
    }
    for (size_t j = 0; j < s->n; j++) {
        SeqColumn *c = &b->cols[j];
        if (rc < 0) { /* roll back to the end of the previous record */
            ExValues *v = &c->v;
            c->nsteps = (size_t)c->row_splits[b->rows];
            v->nvalues = (size_t)c->step_splits[c->nsteps];
            v->arena_len = v->nvalues && s->specs[j].wire == EX_BYTES ? v->ends[v->nvalues - 1] : 0;
            continue;
        }
        c->row_splits[b->rows + 1] = (int64_t)c->nsteps;
        size_t steps = c->nsteps - (size_t)c->row_splits[b->rows];
        if (steps > c->max_steps)
            c->max_steps = steps;
    }
    if (rc < 0)
        return rc;
    b->rows++;
    return 0;
}

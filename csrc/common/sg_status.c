/*
 * sg_status.c - filling SgError reports. Does not allocate, print or exit.
 */
#include "common/sg_status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int sg_fail(SgError *err, int code, const char *fmt, ...)
{
    if (err != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int sg_fail_errno(SgError *err, int code, int errno_value, const char *fmt, ...)
{
    if (err != NULL) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < sizeof err->msg)
            snprintf(err->msg + n, sizeof err->msg - (size_t)n, ": %s", strerror(errno_value));
        err->code = code;
    }
    return code;
}

int sg_context(SgError *err, const char *fmt, ...)
{
    if (err == NULL)
        return SG_EINVAL;
    char prefix[SG_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (n > 0) {
        /* Shift the old message right by the prefix length, truncating. */
        size_t plen = (size_t)n < sizeof err->msg - 1 ? (size_t)n : sizeof err->msg - 1;
        size_t olen = strnlen(err->msg, sizeof err->msg - 1);
        if (plen + olen > sizeof err->msg - 1)
            olen = sizeof err->msg - 1 - plen;
        memmove(err->msg + plen, err->msg, olen);
        memcpy(err->msg, prefix, plen);
        err->msg[plen + olen] = '\0';
    }
    return err->code;
}

void sg_error_clear(SgError *err)
{
    if (err != NULL) {
        err->code = SG_OK;
        err->msg[0] = '\0';
    }
}

const char *sg_status_name(int code)
{
    switch (code) {
    case SG_OK:
        return "SG_OK";
#define SG_STATUS_CASE(name, value, pyname)                                                        \
    case name:                                                                                     \
        return #name;
        SG_STATUS_LIST(SG_STATUS_CASE)
#undef SG_STATUS_CASE
    default:
        return "SG_UNKNOWN";
    }
}

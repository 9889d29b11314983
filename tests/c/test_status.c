/* test_status.c - SgError formatting and the status-name table. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "common/sg_status.h"

static void test_fail_formats_message_and_returns_code(void)
{
    SgError err;
    sg_error_clear(&err);
    int rc = sg_fail(&err, SG_ECORRUPT, "corrupted record at %d", 42);
    CHECK(rc == SG_ECORRUPT);
    CHECK(err.code == SG_ECORRUPT);
    CHECK(strcmp(err.msg, "corrupted record at 42") == 0);
}

static void test_context_prepends(void)
{
    SgError err;
    sg_fail(&err, SG_ETRUNCATED, "truncated record at 7");
    CHECK(sg_context(&err, "reading '%s': ", "a.tfrecord") == SG_ETRUNCATED);
    CHECK(strcmp(err.msg, "reading 'a.tfrecord': truncated record at 7") == 0);
}

static void test_fail_errno_appends_strerror(void)
{
    SgError err;
    sg_fail_errno(&err, SG_EIO, ENOENT, "opening '%s'", "x");
    CHECK(strstr(err.msg, "opening 'x': ") == err.msg);
    CHECK(strstr(err.msg, strerror(ENOENT)) != NULL);
}

static void test_long_messages_are_truncated_not_overflowed(void)
{
    SgError err;
    char big[4 * SG_ERROR_MAX];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    sg_fail(&err, SG_EINVAL, "%s", big);
    CHECK(strlen(err.msg) == SG_ERROR_MAX - 1);
    sg_context(&err, "%s", big);
    CHECK(strlen(err.msg) == SG_ERROR_MAX - 1);
}

static void test_status_names(void)
{
    CHECK(strcmp(sg_status_name(SG_OK), "SG_OK") == 0);
    CHECK(strcmp(sg_status_name(SG_EAUTH), "SG_EAUTH") == 0);
    CHECK(strcmp(sg_status_name(12345), "SG_UNKNOWN") == 0);
}

static void test_null_error_is_allowed(void)
{
    CHECK(sg_fail(NULL, SG_EIO, "ignored") == SG_EIO);
}

int main(void)
{
    test_fail_formats_message_and_returns_code();
    test_context_prepends();
    test_fail_errno_appends_strerror();
    test_long_messages_are_truncated_not_overflowed();
    test_status_names();
    test_null_error_is_allowed();
    return check_report("test_status");
}

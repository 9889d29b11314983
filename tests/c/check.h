/*
 * check.h - the assertion of the C unit tests. CHECK records a failure with
 * its file and line and carries on, so one run reports every mismatch;
 * main ends with `return check_report("test_x");`, non-zero on any failure.
 */
#ifndef SG_TEST_CHECK_H
#define SG_TEST_CHECK_H

#include <stdio.h>

static int failures = 0;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static int check_report(const char *name)
{
    if (failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

#endif /* SG_TEST_CHECK_H */

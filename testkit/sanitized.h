// Whether this test program is built with a sanitizer (ASan or TSan). Such
// builds run the engines several times slower, so the node and drill tests
// widen their probe budgets. GCC says so with __SANITIZE_ADDRESS__ and
// __SANITIZE_THREAD__; clang (before 18) only through __has_feature.
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define WSUP_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define WSUP_TEST_SANITIZED 1
#endif
#endif

#ifndef WSUP_TEST_SANITIZED
#define WSUP_TEST_SANITIZED 0
#endif

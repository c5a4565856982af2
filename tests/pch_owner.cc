// Owns the precompiled header that every test executable reuses
// (tests/CMakeLists.txt); it has no tests of its own. Built as an executable
// so its header is compiled with the flags the tests are compiled with.

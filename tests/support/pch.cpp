// The translation unit that builds the tests' precompiled headers (accel_test_pch in tests/CMakeLists.txt).

// The translation unit that builds the examples' and benchmarks' precompiled headers (accel_program_pch).

// Mixed precision through the Accelerator (placeholder; filled in by the mixed-precision tests).

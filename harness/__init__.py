"""What only tests and benchmarks use: the simulator, the kill matrix, the benchmark. The domain never imports it."""

"""Vector envs that the benchmarks measure fastvec against and that no package ships."""

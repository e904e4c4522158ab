"""The apps on top of everything: the command line (`cli`: `workbench serve`, `workbench bench`),
the benchmarks (`bench`, `bench_embed`) and the soak and fuzz drivers (`soak`, `soak_checks`)."""

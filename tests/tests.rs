//! Integration tests: the built binary, run under mpirun on generated data.

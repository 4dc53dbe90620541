//! Tests of the Negotiate acceptor against a real KDC (`rustle_bench::kdc`).

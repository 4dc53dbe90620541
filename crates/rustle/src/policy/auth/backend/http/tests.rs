//! Tests of the http backend against a callback server started by each test.

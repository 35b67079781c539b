//! Client library for nervad (being built under issue 3).

//! AVX-512 rANS lane encoding (see the module above).

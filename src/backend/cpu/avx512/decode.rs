//! AVX-512 rANS lane decoding (see the module above).

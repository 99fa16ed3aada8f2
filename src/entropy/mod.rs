//! Entropy coding shared by every codec and backend: frequency normalization and integer cost
//! estimates ([`freq`]), and static interleaved rANS ([`rans`]).

pub mod freq;
pub mod rans;

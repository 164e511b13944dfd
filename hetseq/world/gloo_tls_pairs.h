#pragma once
// Gloo's TLS contexts made to connect TLS pairs: Note [Gloo's TLS pairs] (gloo_tls_pairs.cpp).

namespace hetseq {

/// Makes every TCP_TLS context of the process's Gloo connect its peers through TLS pairs, once (later calls
/// return at once), and verifies that it does: Note [Gloo's TLS pairs]. Call before the first Gloo group over TLS
/// is made. Throws hetseq::InputError, which says what to do, when the Gloo in this LibTorch is not one whose
/// route can be checked: then no pair would be known to be encrypted, and hetseq does not send in clear what the
/// user asked to seal.
void route_gloo_tls_pairs();

}  // namespace hetseq

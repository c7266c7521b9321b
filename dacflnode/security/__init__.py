"""Identities of nodes: TLS material (:mod:`.tls`) and a small certificate authority
(:mod:`.certs`)."""

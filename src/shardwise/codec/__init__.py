"""Bytes in, bytes out: native codecs, the inner chunk chain, shards, array metadata."""

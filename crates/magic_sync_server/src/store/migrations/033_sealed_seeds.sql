-- A signing seed may be kept sealed under a key outside the database
-- (`MAGIC_SYNC_SEED_KEY`): `ms-seal-1`, a 12-byte nonce, then the seed
-- encrypted with ChaCha20-Poly1305 and its 16-byte tag (69 bytes in all).
-- A plain seed stays 32 bytes.
ALTER TABLE sync.keys DROP CONSTRAINT keys_seed_check;
ALTER TABLE sync.keys ADD CONSTRAINT keys_seed_check
    CHECK (length(seed) = 32 OR (length(seed) = 69 AND substring(seed FROM 1 FOR 9) = 'ms-seal-1'::bytea));

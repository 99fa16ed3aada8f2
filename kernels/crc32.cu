// CRC-32 (IEEE, zlib's crc32) of a device buffer, for the checks a decoded blob makes: the
// target CRC of the decoded tensor and the reference CRC (docs/FORMAT.md), computed where
// both tensors already are instead of copying them back to hash them on the host.
//
// Each thread hashes p.pad bytes (a multiple of 4) with a byte table in shared memory; the
// block then folds its threads' CRCs into one, left to right, with the standard combine
// crc(A B) = crc(A) * x^(8 |B|) ^ crc(B) over GF(2) (zlib's crc32_combine: multmodp,
// x2nmodp). The host combines the blocks' CRCs the same way (crc32fast's combine).
//
// b1 a tensor of p.n elements of p.width bits (u32 words, little-endian; up to 16 GiB, so
// byte positions are 64-bit); b2 one CRC per block.

#define CRC_POLY 0xedb88320u

// a * b modulo the CRC polynomial, bit-reflected (zlib's multmodp).
LS_FN u32 crc_multmodp(u32 a, u32 b) {
    u32 prod = 0u;
    for (u32 m = 1u << 31u; m != 0u; m >>= 1u) {
        if (a & m) { prod ^= b; }
        b = (b >> 1u) ^ ((b & 1u) ? CRC_POLY : 0u);
    }
    return prod;
}

// x^(n * 2^k) modulo the polynomial; x2n[i] = x^(2^i) (zlib's x2nmodp).
LS_FN u32 crc_x2nmodp(u32 n, u32 k, const u32 *x2n) {
    u32 prod = 1u << 31u;
    while (n != 0u) {
        if (n & 1u) { prod = crc_multmodp(x2n[k & 31u], prod); }
        n >>= 1u;
        k++;
    }
    return prod;
}

// Launched with SCAN_THREADS threads per block.
LS_KERNEL ls_crc32(LS_ARGS) {
    __shared__ u32 table[256];
    __shared__ u32 x2n[32];
    __shared__ u32 crc[SCAN_THREADS];
    __shared__ u32 len[SCAN_THREADS];
    u32 t = threadIdx.x;
    u32 c = t;
    for (u32 i = 0u; i < 8u; i++) { c = (c >> 1u) ^ ((c & 1u) ? CRC_POLY : 0u); }
    table[t] = c;
    if (t == 0u) {
        u32 x = 1u << 30u;
        for (u32 i = 0u; i < 32u; i++) {
            x2n[i] = x;
            x = crc_multmodp(x, x);
        }
    }
    __syncthreads();
    u64 piece = (u64)blockIdx.x * SCAN_THREADS + t;
    u64 bytes = (u64)p.n * (p.width / 8u);
    u64 first = piece * p.pad;
    u64 end = first + p.pad;
    if (first > bytes) { first = bytes; }
    if (end > bytes) { end = bytes; }
    u32 h = 0xffffffffu;
    for (u64 at = first; at < end; at++) {
        u32 byte = (b1[at >> 2u] >> ((u32)(at & 3u) * 8u)) & 0xffu;
        h = table[(h ^ byte) & 0xffu] ^ (h >> 8u);
    }
    crc[t] = ~h;
    len[t] = (u32)(end - first);
    __syncthreads();
    for (u32 off = 1u; off < SCAN_THREADS; off *= 2u) {
        if (t % (2u * off) == 0u) {
            crc[t] = crc_multmodp(crc_x2nmodp(len[t + off], 3u, x2n), crc[t]) ^ crc[t + off];
            len[t] += len[t + off];
        }
        __syncthreads();
    }
    if (t == 0u) { b2[blockIdx.x] = crc[0]; }
}

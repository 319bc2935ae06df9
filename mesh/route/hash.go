package route

// hashString is 64-bit FNV-1a over s, written out so hashing allocates nothing.
func hashString(s string) uint64 {
	return hashMore(14695981039346656037, s)
}

// hashMore continues an FNV-1a hash h over s.
func hashMore(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix is the splitmix64 finaliser; it spreads FNV's weak low bits so that
// hash values can be compared and reduced modulo small numbers fairly.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// unit maps a 64-bit hash to a float64 in the open interval (0, 1).
func unit(h uint64) float64 {
	return (float64(h>>11) + 0.5) / (1 << 53)
}

// Seed derives a well-spread per-request random value from a counter and a
// salt (for example a node-specific constant). Dispatchers can use it to fill
// Facts.Seed without a shared random source.
func Seed(counter, salt uint64) uint64 {
	return mix(counter ^ mix(salt))
}

// canarySalt separates the canary bucket from the sticky hash, so that the
// canary slice and sticky placement are independent.
const canarySalt = "infermesh/canary/v1\x00"

// CanaryBucket returns the caller's fixed position in [0, 100) used to split
// callers between canary and stable nodes. The empty caller has no bucket
// and returns -1 (it always stays on the stable side).
func CanaryBucket(caller string) int {
	if caller == "" {
		return -1
	}
	return int(mix(hashMore(hashString(canarySalt), caller)) % 100)
}

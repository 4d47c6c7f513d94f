package bucket

import "testing"

func TestNodeHasher(t *testing.T) {
	h := NewNodeHasher()
	a, b := []byte("material a"), []byte("material b")
	if h.Sum(a) != h.Sum(a) {
		t.Errorf("Sum is not deterministic")
	}
	if h.Sum(a) == h.Sum(b) {
		t.Errorf("distinct materials share a key")
	}
	if other := NewNodeHasher(); other.Sum(a) == h.Sum(a) {
		t.Errorf("two hashers (seeds) gave the same key")
	}
	if n := testing.AllocsPerRun(100, func() { h.Sum(a) }); n != 0 {
		t.Errorf("Sum allocates %v times", n)
	}
}

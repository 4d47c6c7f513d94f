package descriptors

import "testing"

func TestPattern(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pat      string
		literals int
		yes      []string
		no       []string
	}{
		{"*", 0, []string{"", "a", "/a/b"}, nil},
		{"a*", 1, []string{"a", "ab", "a/b/c"}, []string{"", "b", "ba"}},
		{"*a", 1, []string{"a", "ba", "/x/a"}, []string{"", "ab"}},
		{"a*b", 2, []string{"ab", "axb", "a/x/b"}, []string{"a", "b", "ba", "abc"}},
		{"*a*", 1, []string{"a", "xay", "aaa"}, []string{"", "b"}},
		{"a**b", 2, []string{"ab", "a**b", "axxb"}, []string{"a"}},
		{"/api/*/items/*", 12, []string{"/api/v1/items/", "/api/v1/items/42", "/api//items/x/y"}, []string{"/api/v1/item/1", "/api/items/1"}},
		{"a*a*a", 3, []string{"aaa", "abababa", "a/a/a"}, []string{"aa", "aab"}},
		{"ab*ab", 4, []string{"abab", "abxab"}, []string{"aba", "ab"}},
	}
	for _, tt := range tests {
		t.Run(tt.pat, func(t *testing.T) {
			p := compilePattern(tt.pat)
			if p.literals != tt.literals {
				t.Errorf("compilePattern(%q).literals = %d, want %d", tt.pat, p.literals, tt.literals)
			}
			for _, v := range tt.yes {
				if !p.match(v) {
					t.Errorf("%q.match(%q) = false, want true", tt.pat, v)
				}
			}
			for _, v := range tt.no {
				if p.match(v) {
					t.Errorf("%q.match(%q) = true, want false", tt.pat, v)
				}
			}
		})
	}
}

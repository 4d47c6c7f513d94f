package descriptors

import "testing"

func TestPattern(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pat string
		yes []string
		no  []string
	}{
		{"*", []string{"", "a", "/a/b"}, nil},
		{"a*", []string{"a", "ab", "a/b/c"}, []string{"", "b", "ba"}},
		{"*a", []string{"a", "ba", "/x/a"}, []string{"", "ab"}},
		{"a*b", []string{"ab", "axb", "a/x/b"}, []string{"a", "b", "ba", "abc"}},
		{"*a*", []string{"a", "xay", "aaa"}, []string{"", "b"}},
		{"a**b", []string{"ab", "a**b", "axxb"}, []string{"a"}},
		{"/api/*/items/*", []string{"/api/v1/items/", "/api/v1/items/42", "/api//items/x/y"}, []string{"/api/v1/item/1", "/api/items/1"}},
		{"a*a*a", []string{"aaa", "abababa", "a/a/a"}, []string{"aa", "aab"}},
		{"ab*ab", []string{"abab", "abxab"}, []string{"aba", "ab"}},
	}
	for _, tt := range tests {
		t.Run(tt.pat, func(t *testing.T) {
			p := compilePattern(tt.pat)
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

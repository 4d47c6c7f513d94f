package descriptors

import "errors"

// warned is an error of Parse or New that carries the warnings found beside
// the errors, so that rls validate can show both. It unwraps to the joined
// errors as errors.Join does.
type warned struct {
	error          // errors.Join of the problems
	warns []*Error // sorted and capped
}

// Unwrap returns the joined problems.
func (w warned) Unwrap() []error {
	if j, ok := w.error.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{w.error}
}

// WithWarnings returns err carrying warns as well as the warnings it
// carries already (see WarningsOf), or err itself when there are none.
func WithWarnings(err error, warns []*Error) error {
	warns = append(WarningsOf(err), warns...)
	if err == nil || len(warns) == 0 {
		return err
	}
	return warned{error: err, warns: sortCapped(warns)}
}

// WarningsOf returns the warnings carried by err and the errors it joins
// or wraps: what Parse and New found suspect beside their errors.
func WarningsOf(err error) []*Error {
	var out []*Error
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
			return
		case warned:
			out = append(out, e.warns...) // the inner ones among them
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
		default:
			walk(errors.Unwrap(err))
		}
	}
	walk(err)
	return out
}

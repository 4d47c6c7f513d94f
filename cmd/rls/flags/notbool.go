package flags

import (
	"errors"
	"strconv"
)

// notBool is a boolean flag that sets the negation of its value into the
// field it points at: --refusal-details (default true) sets
// service.Settings.NoRefusalDetails, whose zero value is the default. The
// help prints it as flag.BoolVar would: no value name, "(default true)".
type notBool struct{ b *bool }

// String returns the flag's value: the negation of the field ("false"
// for the zero notBool, which the flag package builds to tell a default
// from the zero value).
func (n notBool) String() string {
	if n.b == nil {
		return "false"
	}
	return strconv.FormatBool(!*n.b)
}

// errParse is the error flag.BoolVar's flags give for a value that is no
// boolean, so that --refusal-details is refused in the same words.
var errParse = errors.New("parse error")

// Set parses a boolean as flag.BoolVar does and stores its negation.
func (n notBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return errParse
	}
	*n.b = !v
	return nil
}

// IsBoolFlag lets --refusal-details stand without a value, meaning true.
func (n notBool) IsBoolFlag() bool { return true }

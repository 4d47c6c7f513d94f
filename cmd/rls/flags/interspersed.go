package flags

import "flag"

// ParseInterspersed parses args into fs as fs.Parse does, but takes flags
// after positional arguments too (rls check k=v --hits 3, rls validate
// f.yaml --strict): the flag package stops at the first positional
// argument, so parsing resumes after each one. "--" still ends the flags:
// every argument after it is positional. fs.Args() returns the positional
// arguments in their order.
//
// Hand-written rather than a library such as pflag: those change how flags
// are spelled (-config, a single dash, would stop working), and rls keeps
// the flag package's syntax.
func ParseInterspersed(fs *flag.FlagSet, args []string) error {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			positional = append(positional, rest...) // after "--": all positional
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	// Parse once more with nothing, after a "--", so that fs.Args() is the
	// positional arguments in order.
	return fs.Parse(append([]string{"--"}, positional...))
}

//go:build !linux

package promtest

import "syscall"

// sysProcAttr has no parent-death signal outside Linux: cleanups alone kill
// the servers.
func sysProcAttr() *syscall.SysProcAttr { return nil }

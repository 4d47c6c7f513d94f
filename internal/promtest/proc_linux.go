package promtest

import "syscall"

// sysProcAttr asks the kernel to kill prometheus when the test process
// dies before its cleanups run (a panic, a -timeout, a SIGKILL).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

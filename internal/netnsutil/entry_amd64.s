#include "textflag.h"

// The entry hook (userns.go). It runs first in the process, before the Go runtime, on the stack
// the kernel built: argc at 0(SP), argv from 8(SP). It must leave SP as it found it for the
// runtime's entry point, which reads argc and argv from there.

#define SYS_setns 308
#define CLONE_NEWUSER 0x10000000
#define CLONE_NEWNET 0x40000000

TEXT ·entry(SB),NOSPLIT|NOFRAME,$0
	MOVQ	$1, ·hookRan(SB)
	MOVQ	8(SP), SI		// argv[0]; NULL when argc is 0
	TESTQ	SI, SI
	JZ	runtime
	LEAQ	·helperArg0(SB), DI
compare:
	MOVBLZX	(DI), AX
	MOVBLZX	(SI), BX
	CMPL	AX, BX
	JNE	runtime
	TESTL	AX, AX
	JZ	helper
	INCQ	SI
	INCQ	DI
	JMP	compare
helper:
	// setns(3, CLONE_NEWUSER): still single-threaded, as the kernel requires.
	MOVQ	$SYS_setns, AX
	MOVQ	$3, DI
	MOVQ	$CLONE_NEWUSER, SI
	SYSCALL
	MOVQ	$1, BX
	TESTQ	AX, AX
	JNE	failed
	// setns(4, CLONE_NEWNET)
	MOVQ	$SYS_setns, AX
	MOVQ	$4, DI
	MOVQ	$CLONE_NEWNET, SI
	SYSCALL
	MOVQ	$2, BX
	TESTQ	AX, AX
	JNE	failed
	JMP	runtime
failed:
	NEGQ	AX			// the kernel returns -errno
	MOVQ	AX, ·hookErrno(SB)
	MOVQ	BX, ·hookStep(SB)
runtime:
	JMP	_rt0_amd64_linux(SB)

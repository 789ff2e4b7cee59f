#include "textflag.h"

// The entry hook (userns.go). It runs first in the process, before the Go runtime, on the stack
// the kernel built: argc at 0(RSP), argv from 8(RSP). It must leave RSP as it found it for the
// runtime's entry point, which reads argc and argv from there.

#define SYS_setns 268
#define CLONE_NEWUSER 0x10000000
#define CLONE_NEWNET 0x40000000

TEXT ·entry(SB),NOSPLIT|NOFRAME,$0
	MOVD	$1, R0
	MOVD	R0, ·hookRan(SB)
	MOVD	8(RSP), R1		// argv[0]; NULL when argc is 0
	CBZ	R1, runtime
	MOVD	$·helperArg0(SB), R2
compare:
	MOVBU	(R1), R3
	MOVBU	(R2), R4
	CMP	R3, R4
	BNE	runtime
	CBZ	R4, helper
	ADD	$1, R1
	ADD	$1, R2
	B	compare
helper:
	// setns(3, CLONE_NEWUSER): still single-threaded, as the kernel requires.
	MOVD	$3, R0
	MOVD	$CLONE_NEWUSER, R1
	MOVD	$SYS_setns, R8
	SVC
	MOVD	$1, R5
	CBNZ	R0, failed
	// setns(4, CLONE_NEWNET)
	MOVD	$4, R0
	MOVD	$CLONE_NEWNET, R1
	MOVD	$SYS_setns, R8
	SVC
	MOVD	$2, R5
	CBNZ	R0, failed
	B	runtime
failed:
	NEG	R0, R0			// the kernel returns -errno
	MOVD	R0, ·hookErrno(SB)
	MOVD	R5, ·hookStep(SB)
runtime:
	B	_rt0_arm64_linux(SB)

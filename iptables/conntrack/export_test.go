package conntrack

// For the tests of the parser and of the refusal mapping.
var (
	ParseCloseWait = parseCloseWait
	Refused        = refused
)

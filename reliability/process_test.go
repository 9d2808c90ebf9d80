package reliability_test

import "github.com/stampede-go/stampede/internal/proctest"

// childModes are the child programs of the tests that run parts of
// themselves in real OS processes (see proctest), by mode; the files that
// define them add them.
var childModes = map[string]proctest.Mode{
	"reader": runReaderChild, // TestDeleteInAnotherProcess
}

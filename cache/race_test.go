//go:build race

package cache

// raceEnabled: tests that do a million of something do fewer under -race.
const raceEnabled = true

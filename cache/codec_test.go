// This file checks the JSON codec (the record format's tests are in
// internal/record).

package cache

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestJSONCodec(t *testing.T) {
	b, err := JSON.Marshal(product{ID: "p1", Price: 3})
	require.NoError(t, err)
	var p product
	require.NoError(t, JSON.Unmarshal(b, &p))
	assert.Equal(t, product{ID: "p1", Price: 3}, p)
	_, err = JSON.Marshal(make(chan int))
	assert.Error(t, err)
}

//go:build tools

package tools

import (
	_ "github.com/juanfont/headscale/cmd/headscale"
)

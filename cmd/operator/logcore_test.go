package main

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// countingCore counts the fields it is asked to encode into derived cores.
type countingCore struct {
	zapcore.Core
	withs *int
}

func (c countingCore) With(fields []zapcore.Field) zapcore.Core {
	*c.withs += len(fields)
	return countingCore{c.Core.With(fields), c.withs}
}

// Fields given to a logger are encoded only once it writes, and then all of them, in order.
func TestLazyFieldsEncodeOnWrite(t *testing.T) {
	obs, logs := observer.New(zapcore.InfoLevel)
	withs := 0
	log := zap.New(lazyFields{countingCore{obs, &withs}})
	quiet := log.With(zap.String("controller", "ingress")).With(zap.String("reconcileID", "1"))
	quiet.Debug("below the level")
	if withs != 0 {
		t.Fatalf("%d fields encoded for a logger that wrote nothing", withs)
	}
	loud := log.With(zap.String("controller", "ingress")).With(zap.String("reconcileID", "2"))
	loud.Info("put Tailscale Service", zap.String("service", "svc:web"))
	if withs != 2 {
		t.Errorf("%d fields encoded for a logger that wrote, want 2", withs)
	}
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("%d entries written, want 1", len(entries))
	}
	got := entries[0].ContextMap()
	for k, want := range map[string]string{"controller": "ingress", "reconcileID": "2", "service": "svc:web"} {
		if got[k] != want {
			t.Errorf("field %s = %v, want %s (all: %v)", k, got[k], want, got)
		}
	}
}

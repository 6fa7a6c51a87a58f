package cli

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer one goroutine writes while another reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// reset --wait resets, then stays until it is told to stop (the uninstall
// DaemonSet's pods: up until deleted), and then exits 0.
func TestResetWait(t *testing.T) {
	root := NewRoot()
	var out lockedBuffer
	root.SetOut(&out)
	root.SetArgs([]string{"reset", "--all", "--wait", "--state-dir", t.TempDir()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), "nothing to restore"); {
		select {
		case err := <-done:
			t.Fatalf("premise: reset --all ran: %v\n%s", err, out.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("premise: reset --all ran: not done after 30 s\n%s", out.String())
		}
	}
	select {
	case err := <-done:
		t.Fatalf("reset --wait ended before it was stopped: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("reset --wait, stopped: %v", err)
	}
}

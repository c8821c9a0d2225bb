// kstatus reads one Kubernetes object as JSON on stdin and prints what the kstatus
// library (sigs.k8s.io/cli-utils, the one Flux and kpt use) computes for it:
// {"status": "InProgress|Current|Failed|...", "message": "..."} on stdout.
//
// The operator's tests use it to check that a KnowledgeBase's status means to
// GitOps tools what the operator says it means.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	// Unstructured's own decoder keeps integers int64, as the library expects.
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(data); err != nil {
		fail(err)
	}
	result, err := status.Compute(obj)
	if err != nil {
		fail(err)
	}
	out, _ := json.Marshal(map[string]string{
		"status":  result.Status.String(),
		"message": result.Message,
	})
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kstatus:", err)
	os.Exit(1)
}

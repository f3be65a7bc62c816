// Command gen-embed writes the provider's two embedded files as its own generate step
// (cmd/pulumi-resource-kubernetes/generate.go upstream) does: schema-embed.json is schema.json
// re-serialized with "version" set, terraform-mapping-embed.json is terraform-mapping.json
// re-serialized. Unlike upstream it takes the source and output directories as arguments,
// because the sources live in the read-only module cache.
//
// Usage: gen-embed VERSION SRC_DIR OUT_DIR
package main

import (
	"encoding/json"
	"log"
	"os"
	"path/filepath"

	"github.com/pulumi/pulumi/pkg/v3/codegen/schema"
)

func main() {
	if len(os.Args) != 4 {
		log.Fatal("usage: gen-embed VERSION SRC_DIR OUT_DIR")
	}
	version, src, out := os.Args[1], os.Args[2], os.Args[3]

	schemaContents, err := os.ReadFile(filepath.Join(src, "schema.json"))
	if err != nil {
		log.Fatal(err)
	}
	var packageSpec schema.PackageSpec
	if err := json.Unmarshal(schemaContents, &packageSpec); err != nil {
		log.Fatalf("cannot deserialize schema: %v", err)
	}
	packageSpec.Version = version
	versionedContents, err := json.Marshal(packageSpec)
	if err != nil {
		log.Fatalf("cannot reserialize schema: %v", err)
	}
	if err := os.WriteFile(filepath.Join(out, "schema-embed.json"), versionedContents, 0o600); err != nil {
		log.Fatal(err)
	}

	terraformContents, err := os.ReadFile(filepath.Join(src, "terraform-mapping.json"))
	if err != nil {
		log.Fatal(err)
	}
	var mapping interface{}
	if err := json.Unmarshal(terraformContents, &mapping); err != nil {
		log.Fatalf("cannot deserialize terraform mapping: %v", err)
	}
	embeddedMapping, err := json.Marshal(mapping)
	if err != nil {
		log.Fatalf("cannot reserialize terraform mapping: %v", err)
	}
	if err := os.WriteFile(filepath.Join(out, "terraform-mapping-embed.json"), embeddedMapping, 0o600); err != nil {
		log.Fatal(err)
	}
}

// Command schemagen writes the JSON schemas kubeconform validates against,
// offline, from two sources pinned by deploy/validate:
//
//   - the OpenAPI v3 documents of a Kubernetes release (api/openapi-spec/v3 in
//     the k8s.io/kubernetes module): one schema per kind of every group
//     version the API server serves;
//   - CustomResourceDefinition files (the snapshot and group snapshot CRDs of
//     the external-snapshotter client module): one schema per served version.
//
// Files are named the way kubeconform looks them up,
// KIND-GROUPPREFIX-VERSION.json (KIND-VERSION.json for the core group), and
// are standalone: every referenced definition is copied under "definitions".
// They are strict: an object that lists its properties accepts no others, so
// a misspelt or misplaced field is an error, as it is for the API server's
// field validation.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

const refPrefix = "#/components/schemas/"
const objectMeta = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

type schema = map[string]any

func main() {
	openapi := flag.String("openapi", "", "directory of Kubernetes OpenAPI v3 documents (api/openapi-spec/v3)")
	crds := flag.String("crds", "", "directory of CustomResourceDefinition YAML files")
	out := flag.String("out", "", "directory to write the schemas into")
	flag.Parse()
	if *openapi == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: schemagen -openapi DIR [-crds DIR] -out DIR")
		os.Exit(2)
	}
	if err := run(*openapi, *crds, *out); err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}

func run(openapiDir, crdDir, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	w := writer{out: out, written: map[string]string{}}
	core, err := builtin(openapiDir, &w)
	if err != nil {
		return err
	}
	if crdDir != "" {
		if err := customResources(crdDir, core, &w); err != nil {
			return err
		}
	}
	fmt.Printf("schemagen: %d schemas in %s\n", len(w.written), out)
	return nil
}

// builtin writes a schema for every kind in the OpenAPI documents and returns
// the definitions of the core group's document (CRD schemas borrow ObjectMeta
// from it).
func builtin(dir string, w *writer) (map[string]any, error) {
	docs, err := filepath.Glob(filepath.Join(dir, "api*__*_openapi.json"))
	if err != nil || len(docs) == 0 {
		return nil, fmt.Errorf("no OpenAPI v3 documents in %s", dir)
	}
	sort.Strings(docs)
	var core map[string]any
	for _, path := range docs {
		group, version, ok := docGroupVersion(filepath.Base(path))
		if !ok {
			continue
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var doc struct {
			Components struct {
				Schemas map[string]any `json:"schemas"`
			} `json:"components"`
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		defs := doc.Components.Schemas
		if group == "" {
			core = defs
		}
		for name, d := range defs {
			for _, gvk := range kindsOf(d) {
				if gvk.Group != group || gvk.Version != version {
					continue
				}
				root, _ := d.(map[string]any)
				if err := w.write(gvk.Kind, group, version, root, defs, path+" "+name); err != nil {
					return nil, err
				}
			}
		}
	}
	if core == nil || core[objectMeta] == nil {
		return nil, fmt.Errorf("no core/v1 document with %s in %s", objectMeta, dir)
	}
	return core, nil
}

// docGroupVersion reads the group and version from a document's file name:
// api__v1_openapi.json is the core group, apis__apps__v1_openapi.json apps/v1.
func docGroupVersion(name string) (string, string, bool) {
	parts := strings.Split(strings.TrimSuffix(name, "_openapi.json"), "__")
	switch {
	case len(parts) == 2 && parts[0] == "api":
		return "", parts[1], true
	case len(parts) == 3 && parts[0] == "apis":
		return parts[1], parts[2], true
	}
	return "", "", false
}

type gvk struct{ Group, Version, Kind string }

func kindsOf(def any) []gvk {
	d, _ := def.(map[string]any)
	list, _ := d["x-kubernetes-group-version-kind"].([]any)
	var out []gvk
	for _, e := range list {
		m, _ := e.(map[string]any)
		g, _ := m["group"].(string)
		v, _ := m["version"].(string)
		k, _ := m["kind"].(string)
		if v != "" && k != "" {
			out = append(out, gvk{g, v, k})
		}
	}
	return out
}

// customResources writes a schema for every served version of every CRD.
func customResources(dir string, core map[string]any, w *writer) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	n := 0
	for _, path := range files {
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var crd struct {
			Kind string `json:"kind"`
			Spec struct {
				Group    string                `json:"group"`
				Names    struct{ Kind string } `json:"names"`
				Versions []struct {
					Name   string `json:"name"`
					Served bool   `json:"served"`
					Schema struct {
						OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
					} `json:"schema"`
				} `json:"versions"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if crd.Kind != "CustomResourceDefinition" {
			continue
		}
		for _, v := range crd.Spec.Versions {
			root := v.Schema.OpenAPIV3Schema
			if !v.Served || root == nil {
				continue
			}
			// The API server checks a custom resource's metadata as ObjectMeta
			// whatever the CRD says; so does this schema.
			if props, ok := root["properties"].(map[string]any); ok {
				props["metadata"] = map[string]any{"$ref": refPrefix + objectMeta}
			}
			if err := w.write(crd.Spec.Names.Kind, crd.Spec.Group, v.Name, root, core, path); err != nil {
				return err
			}
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("no CustomResourceDefinition in %s", dir)
	}
	return nil
}

type writer struct {
	out     string
	written map[string]string // file name -> what it was made from
}

// write converts root and the definitions it reaches into one strict,
// standalone draft-4 schema and writes it under kubeconform's name for it.
func (w *writer) write(kind, group, version string, root map[string]any, defs map[string]any, from string) error {
	name := fileName(kind, group, version)
	if prev, dup := w.written[name]; dup {
		return fmt.Errorf("%s would be written twice (from %s and %s)", name, prev, from)
	}
	w.written[name] = from
	reached := map[string]any{}
	var walk func(s any)
	walk = func(s any) {
		visit(s, func(ref string) {
			if _, seen := reached[ref]; seen {
				return
			}
			d, ok := defs[ref]
			if !ok {
				reached[ref] = map[string]any{} // reported below
				return
			}
			reached[ref] = nil
			walk(d)
		})
	}
	walk(root)
	out := convert(root).(map[string]any)
	definitions := map[string]any{}
	for ref := range reached {
		d, ok := defs[ref]
		if !ok {
			return fmt.Errorf("%s: %s refers to %s, which is not defined", from, name, ref)
		}
		definitions[ref] = convert(d)
	}
	out["$schema"] = "http://json-schema.org/draft-04/schema#"
	if len(definitions) > 0 {
		out["definitions"] = definitions
	}
	data, err := json.Marshal(out)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(w.out, name), data, 0o644)
}

// fileName is kubeconform's {{ .ResourceKind }}{{ .KindSuffix }}.json.
func fileName(kind, group, version string) string {
	suffix := "-" + strings.ToLower(version)
	if group != "" {
		suffix = "-" + strings.ToLower(strings.Split(group, ".")[0]) + suffix
	}
	return strings.ToLower(kind) + suffix + ".json"
}

// visit calls found with the name of every definition s refers to.
func visit(s any, found func(string)) {
	switch v := s.(type) {
	case map[string]any:
		if ref, ok := v["$ref"].(string); ok && strings.HasPrefix(ref, refPrefix) {
			found(strings.TrimPrefix(ref, refPrefix))
		}
		for _, c := range v {
			visit(c, found)
		}
	case []any:
		for _, c := range v {
			visit(c, found)
		}
	}
}

// convert turns one OpenAPI v3 schema into a draft-4 JSON schema: references
// point into "definitions", nullable becomes a null type, int-or-string
// becomes a choice of the two, and objects with listed properties are closed.
func convert(s any) any {
	in, ok := s.(map[string]any)
	if !ok {
		return s
	}
	out := map[string]any{}
	for k, v := range in {
		switch k {
		case "properties":
			props := map[string]any{}
			for name, p := range v.(map[string]any) {
				props[name] = convert(p)
			}
			out[k] = props
		case "items", "additionalProperties", "not":
			out[k] = convert(v)
		case "allOf", "anyOf", "oneOf":
			var list []any
			for _, e := range v.([]any) {
				list = append(list, convert(e))
			}
			out[k] = list
		case "$ref":
			out[k] = "#/definitions/" + strings.TrimPrefix(v.(string), refPrefix)
		case "nullable":
			// handled below
		default:
			out[k] = v
		}
	}
	if in["nullable"] == true {
		if t, ok := out["type"].(string); ok {
			out["type"] = []any{t, "null"}
		}
	}
	if in["x-kubernetes-int-or-string"] == true && in["anyOf"] == nil && in["oneOf"] == nil {
		out["oneOf"] = []any{schema{"type": "integer"}, schema{"type": "string"}}
		delete(out, "type") // a CRD may say string beside it; both are taken
	}
	_, hasProps := in["properties"]
	_, open := in["additionalProperties"]
	if hasProps && !open && in["x-kubernetes-preserve-unknown-fields"] != true {
		out["additionalProperties"] = false
	}
	return out
}

// Pins github.com/kubernetes-csi/external-resizer/v2 v2.3.0; builds its commands with kube-env/build.
module lamina.io/kube-env/resizer

go 1.26.0

require github.com/kubernetes-csi/external-resizer/v2 v2.3.0

require (
	cel.dev/expr v0.25.3 // indirect
	github.com/NYTimes/gziphandler v1.1.1 // indirect
	github.com/antlr4-go/antlr/v4 v4.13.1 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/blang/semver/v4 v4.0.0 // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/container-storage-interface/spec v1.13.0 // indirect
	github.com/coreos/go-semver v0.3.1 // indirect
	github.com/coreos/go-systemd/v22 v22.7.0 // indirect
	github.com/davecgh/go-spew v1.1.2-0.20180830191138-d8f796af33cc // indirect
	github.com/emicklei/go-restful/v3 v3.13.0 // indirect
	github.com/felixge/httpsnoop v1.1.0 // indirect
	github.com/fsnotify/fsnotify v1.10.1 // indirect
	github.com/fxamacker/cbor/v2 v2.9.3 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/go-logr/zapr v1.3.0 // indirect
	github.com/go-openapi/jsonpointer v1.0.0 // indirect
	github.com/go-openapi/jsonreference v1.0.0 // indirect
	github.com/go-openapi/swag v0.29.1 // indirect
	github.com/go-openapi/swag/cmdutils v0.29.1 // indirect
	github.com/go-openapi/swag/conv v0.29.1 // indirect
	github.com/go-openapi/swag/fileutils v0.29.1 // indirect
	github.com/go-openapi/swag/jsonutils v0.29.1 // indirect
	github.com/go-openapi/swag/loading v0.29.1 // indirect
	github.com/go-openapi/swag/mangling v0.29.1 // indirect
	github.com/go-openapi/swag/netutils v0.29.1 // indirect
	github.com/go-openapi/swag/pools v0.29.1 // indirect
	github.com/go-openapi/swag/stringutils v0.29.1 // indirect
	github.com/go-openapi/swag/typeutils v0.29.1 // indirect
	github.com/go-openapi/swag/yamlutils v0.29.1 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/google/cel-go v0.31.0 // indirect
	github.com/google/gnostic-models v0.7.1 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus v1.1.0 // indirect
	github.com/grpc-ecosystem/go-grpc-middleware/v2 v2.3.4 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.30.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/kubernetes-csi/csi-lib-utils v0.24.0 // indirect
	github.com/kylelemons/godebug v1.1.0 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.3-0.20250322232337-35a7c28c31ee // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pmezard/go-difflib v1.0.1-0.20181226105442-5d4384ee4fb2 // indirect
	github.com/prometheus/client_golang v1.24.1 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.70.1 // indirect
	github.com/prometheus/procfs v0.21.1 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	github.com/x448/float16 v0.8.4 // indirect
	go.etcd.io/etcd/api/v3 v3.7.1 // indirect
	go.etcd.io/etcd/client/pkg/v3 v3.7.1 // indirect
	go.etcd.io/etcd/client/v3 v3.7.1 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc v0.70.0 // indirect
	go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp v0.70.0 // indirect
	go.opentelemetry.io/otel v1.46.0 // indirect
	go.opentelemetry.io/otel/exporters/otlp/otlptrace v1.46.0 // indirect
	go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc v1.46.0 // indirect
	go.opentelemetry.io/otel/metric v1.46.0 // indirect
	go.opentelemetry.io/otel/sdk v1.46.0 // indirect
	go.opentelemetry.io/otel/trace v1.46.0 // indirect
	go.opentelemetry.io/proto/otlp v1.11.0 // indirect
	go.uber.org/automaxprocs v1.6.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.uber.org/zap v1.28.0 // indirect
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/crypto v0.56.0 // indirect
	golang.org/x/exp v0.0.0-20260410095643-746e56fc9e2f // indirect
	golang.org/x/net v0.58.0 // indirect
	golang.org/x/oauth2 v0.36.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/term v0.45.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	golang.org/x/time v0.15.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260819154853-08b0e4226688 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260819154853-08b0e4226688 // indirect
	google.golang.org/grpc v1.83.2 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	gopkg.in/evanphx/json-patch.v4 v4.13.0 // indirect
	gopkg.in/inf.v0 v0.9.1 // indirect
	k8s.io/api v0.37.2 // indirect
	k8s.io/apimachinery v0.37.2 // indirect
	k8s.io/apiserver v0.37.1 // indirect
	k8s.io/client-go v0.37.2 // indirect
	k8s.io/component-base v0.37.2 // indirect
	k8s.io/csi-translation-lib v0.37.1 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
	k8s.io/kube-openapi v0.0.0-20260721132016-d427ff9ee9ad // indirect
	k8s.io/streaming v0.37.2 // indirect
	k8s.io/utils v0.0.0-20260626114624-be93311217bd // indirect
	sigs.k8s.io/apiserver-network-proxy/konnectivity-client v0.36.0 // indirect
	sigs.k8s.io/json v0.0.0-20250730193827-2d320260d730 // indirect
	sigs.k8s.io/randfill v1.0.0 // indirect
	sigs.k8s.io/structured-merge-diff/v6 v6.4.2 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)

replace buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go => buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go v1.36.6-20250425153114-8976f5be98c1.1

replace buf.build/go/protovalidate => buf.build/go/protovalidate v0.12.0

replace cel.dev/expr => cel.dev/expr v0.25.1

replace github.com/GoogleCloudPlatform/opentelemetry-operations-go/detectors/gcp => github.com/GoogleCloudPlatform/opentelemetry-operations-go/detectors/gcp v1.32.0

replace github.com/container-storage-interface/spec => github.com/container-storage-interface/spec v1.12.1-0.20260720052920-cd9e7ad1ae09

replace github.com/felixge/httpsnoop => github.com/felixge/httpsnoop v1.0.4

replace github.com/fsnotify/fsnotify => github.com/fsnotify/fsnotify v1.9.0

replace github.com/fxamacker/cbor/v2 => github.com/fxamacker/cbor/v2 v2.9.1

replace github.com/go-logr/logr => github.com/go-logr/logr v1.4.3

replace github.com/go-openapi/swag => github.com/go-openapi/swag v0.27.1

replace github.com/go-openapi/swag/cmdutils => github.com/go-openapi/swag/cmdutils v0.27.1

replace github.com/go-openapi/swag/conv => github.com/go-openapi/swag/conv v0.27.1

replace github.com/go-openapi/swag/fileutils => github.com/go-openapi/swag/fileutils v0.27.1

replace github.com/go-openapi/swag/jsonutils => github.com/go-openapi/swag/jsonutils v0.27.1

replace github.com/go-openapi/swag/jsonutils/fixtures_test => github.com/go-openapi/swag/jsonutils/fixtures_test v0.27.1

replace github.com/go-openapi/swag/loading => github.com/go-openapi/swag/loading v0.27.1

replace github.com/go-openapi/swag/mangling => github.com/go-openapi/swag/mangling v0.27.1

replace github.com/go-openapi/swag/netutils => github.com/go-openapi/swag/netutils v0.27.1

replace github.com/go-openapi/swag/pools => github.com/go-openapi/swag/pools v0.27.1

replace github.com/go-openapi/swag/stringutils => github.com/go-openapi/swag/stringutils v0.27.1

replace github.com/go-openapi/swag/typeutils => github.com/go-openapi/swag/typeutils v0.27.1

replace github.com/go-openapi/swag/yamlutils => github.com/go-openapi/swag/yamlutils v0.27.1

replace github.com/go-openapi/testify/enable/yaml/v2 => github.com/go-openapi/testify/enable/yaml/v2 v2.6.0

replace github.com/go-openapi/testify/v2 => github.com/go-openapi/testify/v2 v2.6.0

replace github.com/godbus/dbus/v5 => github.com/godbus/dbus/v5 v5.2.2

replace github.com/google/cel-go => github.com/google/cel-go v0.29.2

replace github.com/google/gnostic-models => github.com/google/gnostic-models v0.7.0

replace github.com/grpc-ecosystem/go-grpc-middleware/v2 => github.com/grpc-ecosystem/go-grpc-middleware/v2 v2.3.3

replace github.com/grpc-ecosystem/grpc-gateway/v2 => github.com/grpc-ecosystem/grpc-gateway/v2 v2.29.0

replace github.com/klauspost/compress => github.com/klauspost/compress v1.19.0

replace github.com/mailru/easyjson => github.com/mailru/easyjson v0.7.7

replace github.com/prometheus/client_golang => github.com/prometheus/client_golang v1.24.0

replace github.com/prometheus/client_model => github.com/prometheus/client_model v0.6.2

replace github.com/prometheus/common => github.com/prometheus/common v0.70.0

replace github.com/spiffe/go-spiffe/v2 => github.com/spiffe/go-spiffe/v2 v2.6.0

replace github.com/stoewer/go-strcase => github.com/stoewer/go-strcase v1.3.0

replace github.com/stretchr/testify => github.com/stretchr/testify v1.11.1

replace go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 v3.7.0

replace go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 v3.7.0

replace go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 v3.7.0

replace go.opentelemetry.io/contrib/detectors/gcp => go.opentelemetry.io/contrib/detectors/gcp v1.43.0

replace go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc => go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc v0.68.0

replace go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp => go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp v0.69.0

replace go.opentelemetry.io/otel => go.opentelemetry.io/otel v1.44.0

replace go.opentelemetry.io/otel/exporters/otlp/otlptrace => go.opentelemetry.io/otel/exporters/otlp/otlptrace v1.44.0

replace go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc => go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc v1.44.0

replace go.opentelemetry.io/otel/metric => go.opentelemetry.io/otel/metric v1.44.0

replace go.opentelemetry.io/otel/sdk => go.opentelemetry.io/otel/sdk v1.44.0

replace go.opentelemetry.io/otel/sdk/metric => go.opentelemetry.io/otel/sdk/metric v1.44.0

replace go.opentelemetry.io/otel/trace => go.opentelemetry.io/otel/trace v1.44.0

replace go.opentelemetry.io/proto/otlp => go.opentelemetry.io/proto/otlp v1.10.0

replace go.uber.org/zap => go.uber.org/zap v1.27.1

replace go.yaml.in/yaml/v3 => go.yaml.in/yaml/v3 v3.0.4

replace golang.org/x/crypto => golang.org/x/crypto v0.54.0

replace golang.org/x/mod => golang.org/x/mod v0.37.0

replace golang.org/x/net => golang.org/x/net v0.57.0

replace golang.org/x/text => golang.org/x/text v0.40.0

replace golang.org/x/tools => golang.org/x/tools v0.47.0

replace google.golang.org/genproto/googleapis/api => google.golang.org/genproto/googleapis/api v0.0.0-20260526163538-3dc84a4a5aaa

replace google.golang.org/genproto/googleapis/rpc => google.golang.org/genproto/googleapis/rpc v0.0.0-20260526163538-3dc84a4a5aaa

replace google.golang.org/grpc => google.golang.org/grpc v1.82.1

replace google.golang.org/protobuf => google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af

replace k8s.io/api => k8s.io/api v0.37.2

replace k8s.io/apimachinery => k8s.io/apimachinery v0.37.2

replace k8s.io/apiserver => k8s.io/apiserver v0.37.2

replace k8s.io/client-go => k8s.io/client-go v0.37.2

replace k8s.io/component-base => k8s.io/component-base v0.37.2

replace k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.37.2

replace k8s.io/gengo/v2 => k8s.io/gengo/v2 v2.0.0-20260408192533-25e2208e0dc3

replace k8s.io/kms => k8s.io/kms v0.37.2

replace k8s.io/streaming => k8s.io/streaming v0.37.2

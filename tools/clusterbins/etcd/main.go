// Command etcd is the etcd server, built from the module proxy: `go install` of
// go.etcd.io/etcd/server/v3 fails on its relative replaces, so we call its main here.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}

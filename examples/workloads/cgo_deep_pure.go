//go:build !cgo

// Without cgo, cgo_deep.go spins in its Go chain only.
package main

func callC(rounds int) {}

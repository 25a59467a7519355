"""muestra's wire contracts, version 1: stubs generated from the .proto files beside this file."""

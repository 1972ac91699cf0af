module flatkv.example

go 1.19

require github.com/apache/thrift v0.17.0

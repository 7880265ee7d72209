"""What a person reads about a compiled pipeline: the balance table, the compile summary,
`pipecompile show`, the text timeline, and the pictures. Reports read an emitted directory
(a manifest and a program), never the compiler."""

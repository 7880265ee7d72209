"""The records of an emitted directory and of a compile, read and written as typed values:
the manifest (``manifest``), the compiler's result (``compiled``), the plan search's record
(``plan_record``), the decoding plan (``generation_plan``), the balance report
(``balance_report``), and byte sizes as people write them (``sizes``)."""

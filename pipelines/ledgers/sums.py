"""What the ledger's triggers and its running sums share across both databases
(``sqlite_backend`` for a file, ``postgres_backend`` for a server): the message a trigger
refuses an older thresher's release with, and the statement that marks every dataset's
running sums for folding again from its releases."""

NO_RECORD = ("a release without its (rho, delta0) record cannot be charged to this ledger: "
             "it is kept by a newer thresher, which keeps running sums that this version "
             "does not update; upgrade thresher to charge it")

UNFOLD = ("UPDATE datasets SET spent_epsilon = NULL, spent_delta = NULL, spent_rho = NULL, "
          "spent_delta0 = NULL, spent_row_changes = NULL")

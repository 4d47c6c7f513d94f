// Package emergency holds the accepted secrets of sluice's emergency
// channel: requests whose emergency descriptor entry carries one of them
// are allowed whatever the limits (service.Options.EmergencyKey).
//
// The secrets themselves are never stored: a File reads the hex SHA-256
// digests of the accepted secrets from a file, one per line, and re-reads it
// when it changes, so that a secret rotates without a restart (several
// lines let an old and a new secret overlap). Match hashes a candidate and
// compares it in constant time with every digest. Nothing in this package
// logs a secret, a digest or a line of the file.
//
// The service knows a File only as a service.EmergencySecrets.
package emergency
